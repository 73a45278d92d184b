package atomicphase_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
)

// constValues returns the string constants of the given type declared in
// the Go files of dir, by name.
func constValues(t *testing.T, dir, typeName string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				id, ok := vs.Type.(*ast.Ident)
				if !ok || id.Name != typeName || len(vs.Values) != len(vs.Names) {
					continue
				}
				for i, name := range vs.Names {
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					values[name.Name] = v
				}
			}
		}
	}
	if len(values) == 0 {
		t.Fatalf("no constants of type %s in %s", typeName, dir)
	}
	return values
}

func valueSet(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// TestEveryNameIsSpelledTheSameEverywhere keeps one name for each idea
// (docs/glossary.md): every outcome is also an event of the same spelling;
// the statuses are what Counts prints under -json and what the console and
// the gauge show; holds are statuses; and the words the library retired
// appear nowhere a user reads.
func TestEveryNameIsSpelledTheSameEverywhere(t *testing.T) {
	t.Parallel()
	outcomes := constValues(t, "phase", "OutcomeKind")
	events := valueSet(constValues(t, "keyrow", "EventKind"))
	for name, v := range outcomes {
		if !slices.Contains(events, v) {
			t.Errorf("outcome %s (%q) has no event of the same spelling in keyrow.EventKind", name, v)
		}
	}

	statuses := valueSet(constValues(t, "keyrow", "Status"))
	var listed []string
	for _, s := range keyrow.Statuses() {
		listed = append(listed, string(s))
	}
	slices.Sort(listed)
	if !slices.Equal(listed, statuses) {
		t.Errorf("keyrow.Statuses() lists %v; the Status constants are %v", listed, statuses)
	}
	raw, err := json.Marshal(keyrow.Counts{})
	if err != nil {
		t.Fatal(err)
	}
	var counted map[string]any
	if err := json.Unmarshal(raw, &counted); err != nil {
		t.Fatal(err)
	}
	var countKeys []string
	for k := range counted {
		countKeys = append(countKeys, k)
	}
	slices.Sort(countKeys)
	if !slices.Equal(countKeys, statuses) {
		t.Errorf("keyrow.Counts prints %v under -json; the statuses are %v", countKeys, statuses)
	}
	for name, v := range constValues(t, "keyrow", "Hold") {
		if !slices.Contains(statuses, v) {
			t.Errorf("hold %s (%q) is not a status of the same spelling", name, v)
		}
	}

	// The gauge and the console name statuses by the keyrow constants,
	// never by literals of their own.
	for _, path := range []string{"otelphase/otelphase.go", "console/pages.go", "console/console.go"} {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range statuses {
			if strings.Contains(string(src), strconv.Quote(s)+":") {
				t.Errorf("%s spells status %q itself; use keyrow.Status%s", path, s, s)
			}
		}
	}

	// Words retired for another, wherever a user reads (internal packages
	// are read by their authors only): lock for lease in names, buried for dead,
	// runnable for waiting or stuck, acquired for new, conflicts for
	// refused, MinIdle for StuckAfter.
	retired := regexp.MustCompile(`\b(LockTTL|LockedAt|LockExpiresAt|ErrNotLocked|runnable|[Bb]uried|EventAcquired|"acquired"|atomicphase\.conflicts|MinIdle|min-idle|lock-ttl|EventExpired)\b`)
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "api" || d.Name() == "internal") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case path == "CHANGELOG.md", strings.HasSuffix(path, "_test.go"):
			return nil
		case strings.HasSuffix(path, ".go"), strings.HasSuffix(path, ".md"), strings.HasSuffix(path, ".html"), strings.HasSuffix(path, ".js"):
		default:
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if m := retired.FindString(line); m != "" {
				t.Errorf("%s:%d says %q, a retired name (docs/glossary.md)", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
