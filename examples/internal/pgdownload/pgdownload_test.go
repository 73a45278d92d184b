package pgdownload_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/examples/internal/pgdownload"
	"github.com/atomicphase/atomicphase/examples/internal/pgdownload/pgdownloadtest"
)

// server returns a package with the layout of the real ones: programs in
// bin, a library under its full version and the link of its shorter name
// listed for npm's install script, and share files.
func server() *pgdownloadtest.Package {
	var p pgdownloadtest.Package
	p.File("bin/initdb", 0o755, []byte("#!/bin/sh\necho initdb\n"))
	p.File("bin/postgres", 0o755, []byte("#!/bin/sh\necho postgres\n"))
	p.File("lib/libpq.so.5.18", 0o644, []byte("libpq"))
	p.Link("lib/libpq.so.5", "lib/libpq.so.5.18")
	p.File("share/postgresql/timezonesets/Default", 0o644, []byte("UTC 0\n"))
	return &p
}

func TestBinDirDownloadsOnceAndLinksTheLibraries(t *testing.T) {
	t.Parallel()
	reg := pgdownloadtest.Serve(t, server().Tarball(t), "")
	cache := t.TempDir()
	var progress bytes.Buffer
	cfg := pgdownload.Config{Registry: reg.URL, CacheDir: cache, Progress: &progress}
	bin, err := pgdownload.BinDir(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pkg, _ := pgdownload.Package()
	if want := filepath.Join(cache, path.Base(pkg)+"-"+pgdownload.Version, "bin"); bin != want {
		t.Errorf("BinDir = %s, want %s", bin, want)
	}
	if reg.Downloads() != 1 || !strings.Contains(progress.String(), "downloading PostgreSQL") {
		t.Errorf("downloaded %d times, saying %q; want once, saying so", reg.Downloads(), progress.String())
	}
	for _, name := range []string{"initdb", "postgres"} {
		info, err := os.Stat(filepath.Join(bin, name))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o755 {
			t.Errorf("%s has mode %v, want 0755", name, info.Mode().Perm())
		}
	}
	root := filepath.Dir(bin)
	if b, err := os.ReadFile(filepath.Join(root, "lib", "libpq.so.5")); err != nil || string(b) != "libpq" {
		t.Errorf("lib/libpq.so.5 reads %q, %v; want the library it links to", b, err)
	}
	if to, err := os.Readlink(filepath.Join(root, "lib", "libpq.so.5")); err != nil || to != "libpq.so.5.18" {
		t.Errorf("lib/libpq.so.5 links to %q (%v), want the relative libpq.so.5.18", to, err)
	}
	if _, err := os.Stat(filepath.Join(root, "share", "postgresql", "timezonesets", "Default")); err != nil {
		t.Error(err)
	}
	for _, npmOnly := range []string{"package.json", "scripts", "package"} {
		if _, err := os.Stat(filepath.Join(root, npmOnly)); err == nil {
			t.Errorf("%s unpacked: only native/ holds the server", npmOnly)
		}
	}

	progress.Reset()
	again, err := pgdownload.BinDir(context.Background(), cfg)
	if err != nil || again != bin {
		t.Fatalf("second BinDir = %s, %v; want %s", again, err, bin)
	}
	if reg.Downloads() != 1 || progress.Len() > 0 {
		t.Errorf("second BinDir downloaded (%d downloads in all) or said %q", reg.Downloads(), progress.String())
	}
	assertOnly(t, cache, path.Base(pkg)+"-"+pgdownload.Version)
}

// A download whose bytes are not those the registry's integrity names,
// altered or corrupted on the way, is refused and leaves nothing behind.
func TestBinDirRefusesADownloadThatDoesNotMatchItsIntegrity(t *testing.T) {
	t.Parallel()
	reg := pgdownloadtest.Serve(t, server().Tarball(t), pgdownloadtest.Integrity([]byte("another package")))
	cache := t.TempDir()
	_, err := pgdownload.BinDir(context.Background(), pgdownload.Config{Registry: reg.URL, CacheDir: cache})
	if err == nil || !strings.Contains(err.Error(), "does not match its integrity") {
		t.Fatalf("BinDir: %v, want an integrity mismatch", err)
	}
	assertOnly(t, cache)
}

// Entries that would write outside the cache directory, or that are not
// plain files and directories, fail the download.
func TestBinDirRefusesEntriesThatLeaveThePackage(t *testing.T) {
	t.Parallel()
	for name, add := range map[string]func(*pgdownloadtest.Package){
		"name outside":  func(p *pgdownloadtest.Package) { p.File("../../escaped", 0o644, []byte("x")) },
		"absolute name": func(p *pgdownloadtest.Package) { p.File("/tmp/escaped", 0o644, []byte("x")) },
		"symbolic link": func(p *pgdownloadtest.Package) {
			p.Entry(tar.Header{Name: "lib/l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, nil)
		},
		"link outside":    func(p *pgdownloadtest.Package) { p.Link("../escaped", "lib/libpq.so.5.18") },
		"link to outside": func(p *pgdownloadtest.Package) { p.Link("lib/l", "../../../etc/passwd") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := server()
			add(p)
			reg := pgdownloadtest.Serve(t, p.Tarball(t), "")
			cache := filepath.Join(t.TempDir(), "cache")
			_, err := pgdownload.BinDir(context.Background(), pgdownload.Config{Registry: reg.URL, CacheDir: cache})
			if err == nil {
				t.Fatal("BinDir succeeded")
			}
			t.Log(err)
			assertOnly(t, cache)
			if _, err := os.Lstat(filepath.Join(filepath.Dir(cache), "escaped")); err == nil {
				t.Error("the package wrote outside the cache directory")
			}
		})
	}
}

func TestBinDirReportsARegistryWithoutThePackage(t *testing.T) {
	t.Parallel()
	reg := pgdownloadtest.Serve(t, server().Tarball(t), "")
	cache := t.TempDir()
	_, err := pgdownload.BinDir(context.Background(), pgdownload.Config{Registry: reg.URL + "/elsewhere", CacheDir: cache})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("BinDir: %v, want the registry's 404", err)
	}
	assertOnly(t, cache)
}

// assertOnly checks that dir holds the entries names and nothing else: no
// partial download.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}
