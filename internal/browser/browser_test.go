package browser

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestChromiumLeavesNothingInTheHomeOrTemporaryDirectory: the browser of
// the console's tests keeps what it writes (its crash reports, dconf's
// cache, its process singleton's socket) in the test's own temporary
// directories, not in the home directory of whoever runs the tests, nor in
// the system's temporary directory, where a browser that is killed leaves
// them behind.
func TestChromiumLeavesNothingInTheHomeOrTemporaryDirectory(t *testing.T) {
	home := t.TempDir()
	// Short, unlike t.TempDir's, so that a socket's path fits under it.
	tmp, err := os.MkdirTemp("", "browser")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("TMPDIR", tmp)
	// In a subtest, so that the browser is gone, and its test's cleanups
	// done, before the directories are read.
	t.Run("browse", func(t *testing.T) {
		ctx := Start(t, 800, 600)
		if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
			t.Fatal(err)
		}
	})
	for _, dir := range []string{home, tmp} {
		var left []string
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if path != dir {
				left = append(left, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(left) > 0 {
			t.Errorf("Chromium left in %s:\n%v", dir, left)
		}
	}
}
