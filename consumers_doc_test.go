package atomicphase_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestConsumersGuideQuotesCompiledCode keeps every Go block of
// docs/consumers.md an excerpt, line for line up to indentation, of a Go
// file that go vet and go test compile (natsphase's in its own module), so
// that the guide's code builds as written.
func TestConsumersGuideQuotesCompiledCode(t *testing.T) {
	guide, err := os.ReadFile("docs/consumers.md")
	if err != nil {
		t.Fatal(err)
	}
	sources := goSources(t)
	blocks := 0
	for rest := string(guide); ; {
		_, block, ok := strings.Cut(rest, "```go\n")
		if !ok {
			break
		}
		block, rest, ok = strings.Cut(block, "```\n")
		if !ok {
			t.Fatal("docs/consumers.md has a Go block that is not closed")
		}
		blocks++
		want := unindented(strings.TrimSuffix(block, "\n"))
		if !slices.ContainsFunc(sources, func(src []string) bool { return containsRun(src, want) }) {
			t.Errorf("docs/consumers.md quotes Go code that no Go file of the repository holds; copy it from the example or test it shows:\n%s", block)
		}
	}
	if blocks < 5 {
		t.Errorf("docs/consumers.md has %d Go blocks, want its verdict switch, River recipe and JetStream example", blocks)
	}
}

// TestNatsphasePackageDocQuotesItsExample keeps the code that opens
// natsphase's package comment, which go doc shows, an excerpt of its
// compiled example.
func TestNatsphasePackageDocQuotesItsExample(t *testing.T) {
	doc, err := os.ReadFile("natsphase/doc.go")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("natsphase/example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	// The first block of code is the example's; the go.mod lines come
	// later.
	var block []string
	for l := range strings.Lines(string(doc)) {
		code, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "//\t")
		if !ok && len(block) > 0 {
			break
		}
		if ok {
			block = append(block, code)
		}
	}
	if len(block) == 0 {
		t.Fatal("natsphase/doc.go shows no code")
	}
	if !containsRun(unindented(string(example)), unindented(strings.Join(block, "\n"))) {
		t.Errorf("natsphase/doc.go shows code that natsphase/example_test.go does not hold:\n%s", strings.Join(block, "\n"))
	}
}

// goSources returns the lines, unindented, of every Go file of the
// repository.
func goSources(t *testing.T) [][]string {
	t.Helper()
	var sources [][]string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules"):
			return filepath.SkipDir
		case !d.IsDir() && strings.HasSuffix(path, ".go"):
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sources = append(sources, unindented(string(src)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sources
}

// unindented returns text's lines without their leading tabs.
func unindented(text string) []string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimLeft(l, "\t")
	}
	return lines
}

// containsRun reports whether run appears in lines as consecutive lines.
func containsRun(lines, run []string) bool {
	for i := 0; i+len(run) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(run)], run) {
			return true
		}
	}
	return false
}
