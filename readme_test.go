package atomicphase_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeQuickStartIsTheCompiledProgram keeps the README's complete
// program identical to examples/quickstart/main.go, which go vet and go
// build compile with the rest of the module.
func TestReadmeQuickStartIsTheCompiledProgram(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("examples/quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	const fence = "```go\n"
	_, rest, ok := strings.Cut(string(readme), "## Quick start")
	if !ok {
		t.Fatal("README has no Quick start section")
	}
	_, rest, ok = strings.Cut(rest, fence)
	if !ok {
		t.Fatal("README's Quick start has no Go block")
	}
	block, _, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("README's Quick start Go block is not closed")
	}
	if block != string(program) {
		t.Fatalf("README's quick start differs from examples/quickstart/main.go; copy the file into the README")
	}
}
