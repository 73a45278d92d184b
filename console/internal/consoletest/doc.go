// Package consoletest holds the console's fixture, a database with keys in
// every state and hostile values, and the console's tests in a real
// browser, which need chromedp. They live in a package programs cannot
// import, not in package console's own test files, because go mod tidy
// records in an importer's go.sum the modules that the tests of every
// package it imports need: chromedp would reach every program that uses
// the console.
package consoletest
