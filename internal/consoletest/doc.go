// Package consoletest holds the console's fixture, a database with keys in
// every state and hostile values, and the console's tests in a real
// browser, which need chromedp: as an internal package, it keeps chromedp
// out of what programs importing the library download.
package consoletest
