package atomicphase_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
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

// TestReadmeIsAFrontPage keeps the README short enough to read as the
// project's front page; detail belongs in the guides under docs/.
func TestReadmeIsAFrontPage(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const limit = 350
	if n := strings.Count(string(readme), "\n"); n > limit {
		t.Fatalf("README.md has %d lines, more than %d: move detail into a guide under docs/", n, limit)
	}
}

// TestDocLinksResolve checks every relative link in the README and the
// guides: the file exists, and a #fragment names a heading in it.
func TestDocLinksResolve(t *testing.T) {
	pages := docPages(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(withoutCodeBlocks(string(text)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, fragment, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
				continue
			}
			if fragment != "" && !slices.Contains(headingAnchors(t, path), fragment) {
				t.Errorf("%s links to %s, but %s has no heading with that anchor", page, target, path)
			}
		}
	}
}

// withoutCodeBlocks drops fenced code blocks, whose brackets are not links.
func withoutCodeBlocks(markdown string) string {
	var b strings.Builder
	inCode := false
	for line := range strings.Lines(markdown) {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			b.WriteString(line)
		}
	}
	return b.String()
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lower case, punctuation dropped, spaces as hyphens.
func headingAnchors(t *testing.T, path string) []string {
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var anchors []string
	for line := range strings.Lines(withoutCodeBlocks(string(text))) {
		title, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "#")
		if !ok {
			continue
		}
		title = strings.TrimSpace(strings.TrimLeft(title, "#"))
		anchor := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, title)
		anchors = append(anchors, anchor)
	}
	return anchors
}

// TestReadmeStatusTableNamesEveryAnswer keeps the README's table of HTTP
// answers in step with what the handler sends: every status it answers
// has a row, and the rows name where the answers a user's own functions
// cause come from (a field that failed validation is a 422 like a reused
// key; an outage in a Tenant or Decode function is the store's 503).
func TestReadmeStatusTableNamesEveryAnswer(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for line := range strings.Lines(string(readme)) {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "| ") {
			continue
		}
		for status := range strings.SplitSeq(cells[1], "/") {
			if f := strings.Fields(status); len(f) > 0 {
				rows[f[0]] = append(rows[f[0]], line)
			}
		}
	}
	for _, status := range []string{"400", "401", "405", "409", "413", "415", "422", "500", "503"} {
		if len(rows[status]) == 0 {
			t.Errorf("README's status table has no row for %s", status)
		}
	}
	for status, want := range map[string]string{"422": "phase.Invalid", "503": "phase.ErrUnavailable"} {
		if !strings.Contains(strings.Join(rows[status], ""), want) {
			t.Errorf("README's %s rows do not mention %s:\n%s", status, want, strings.Join(rows[status], ""))
		}
	}
}

// TestReadmeBuildOutputIsIgnored keeps the binaries that the README's
// `go build -o bin/` writes out of git status.
func TestReadmeBuildOutputIsIgnored(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed")
	}
	if out, err := exec.Command(git, "rev-parse", "--is-inside-work-tree").Output(); err != nil || strings.TrimSpace(string(out)) != "true" {
		t.Skip("not a git checkout")
	}
	for _, path := range []string{"bin/rides", "bin/atomicphase", "bin/quickstart"} {
		if err := exec.Command(git, "check-ignore", "-q", path).Run(); err != nil {
			t.Errorf("git does not ignore %s, which the README's go build -o bin/ writes: %v", path, err)
		}
	}
}

// TestDocsNameOnlyTestsThatExist checks every test the README and the
// guides name: some test function of the module starts with the name (a
// guide may name a family, TestCheckRefuses..., or a -run prefix).
func TestDocsNameOnlyTestsThatExist(t *testing.T) {
	testFunc := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)
	var tests []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(src), -1) {
			tests = append(tests, m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) < 100 {
		t.Fatalf("found only %d test functions", len(tests))
	}

	named := regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*`)
	for _, page := range docPages(t) {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range named.FindAllString(string(text), -1) {
			if !slices.ContainsFunc(tests, func(test string) bool { return strings.HasPrefix(test, name) }) {
				t.Errorf("%s names %s, but no test function of the module starts with that name", page, name)
			}
		}
	}
}

// docPages returns the README, the guides and the examples' READMEs.
func docPages(t *testing.T) []string {
	t.Helper()
	var pages []string
	for _, pattern := range []string{"README.md", "docs/*.md", "examples/*/README.md"} {
		found, err := filepath.Glob(pattern)
		if err != nil || len(found) == 0 {
			t.Fatalf("%s: found %v, %v", pattern, found, err)
		}
		pages = append(pages, found...)
	}
	return pages
}
