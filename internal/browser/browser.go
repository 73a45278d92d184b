// Package browser starts headless Chromium for the tests that look at the
// console as an operator does, through chromedp.
package browser

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/atomicphase/atomicphase/internal/testenv"
)

// Start starts headless Chromium on a fresh profile, with a window
// width×height pixels and any further flags, and returns a context for
// chromedp on its first tab, which ends with the test. Whatever Chromium
// writes stays in the test's temporary directories. It skips the test
// when Chromium is not installed, unless the environment requires it.
func Start(t *testing.T, width, height int, flags ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		testenv.SkipWithout(t, "chromium", errors.New("not installed (Debian: apt-get install chromium)"))
	}
	// Chromium writes its crash reports' database under the XDG config
	// directory and dconf its cache under the XDG cache directory, whatever
	// the profile: both go to the test's temporary directory, not to the
	// home directory of whoever runs the tests. Its process singleton's
	// socket goes to a directory of its own in the temporary directory,
	// removed with it: a killed browser leaves the socket's directory
	// behind, and a path under t.TempDir, named for the test, can be longer
	// than a socket's path may be.
	home := t.TempDir()
	tmp, err := os.MkdirTemp("", "chromium")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(width, height),
		chromedp.Env("HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "XDG_CACHE_HOME="+filepath.Join(home, ".cache"),
			"TMPDIR="+tmp))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(opts, flags...)...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first call starts the browser, which lives as long as its
	// context: no timeout on that one.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	return ctx
}

// ScreenshotsEnv names the directory Screenshot writes to.
const ScreenshotsEnv = "ATOMICPHASE_CONSOLE_SCREENSHOTS"

// Screenshot saves the whole page as name.png in the directory
// ScreenshotsEnv names (docs/img for the docs), and does nothing when it
// names none.
func Screenshot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		dir := os.Getenv(ScreenshotsEnv)
		if dir == "" {
			return nil
		}
		png, err := chromedp.FullScreenshot(100)(ctx, t)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	})
}
