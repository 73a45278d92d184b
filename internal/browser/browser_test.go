package browser

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestChromiumLeavesNothingInTheHomeDirectory: the browser of the console's
// tests keeps what it writes (its crash reports, dconf's cache) in the
// test's temporary directories, not in the home directory of whoever runs
// the tests.
func TestChromiumLeavesNothingInTheHomeDirectory(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "")
	ctx := Start(t, 800, 600)
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	var left []string
	err := filepath.WalkDir(home, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != home {
			left = append(left, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("Chromium wrote to the home directory:\n%v", left)
	}
}
