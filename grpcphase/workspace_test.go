package grpcphase_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestTheDocsWorkspaceRecipeBuildsAProgramOnThisCheckout follows
// docs/grpc.md's "Depending on the modules": a module of its own that
// imports grpcphase, built against this checkout through go work.
func TestTheDocsWorkspaceRecipeBuildsAProgramOnThisCheckout(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/payments\n\ngo 1.26\n",
		"main.go": `package main

import "github.com/atomicphase/atomicphase/grpcphase"

func main() {
	if _, err := grpcphase.UnaryClientInterceptor(grpcphase.ClientConfig{}); err != nil {
		panic(err)
	}
}
`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, args := range [][]string{
		{"work", "init", "."},
		{"work", "use", root, filepath.Join(root, "protophase"), filepath.Join(root, "grpcphase")},
		{"build", "-o", os.DevNull, "."},
	} {
		cmd := exec.Command(goTool, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
	}
}
