// Package pgschema names the Postgres schema that holds the library's tables
// and functions, when it is not the one the connection's search_path finds,
// and rewrites the library's statements for it.
//
// Every statement of the library is written against the unqualified names
// of its objects (idempotency_keys, atomicphase_lease_lost() and the rest,
// see [Objects]). [Qualify] prefixes each of them with the schema, quoted,
// as River prefixes its tables with Config.Schema: the statements then run
// whatever the search_path is, and reach the tables of that schema only.
// Package store caches the result per client; the migrations are rewritten
// the same way when they are applied or printed for a schema.
package pgschema

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Objects are the names of the tables and functions the migrations create,
// which Qualify prefixes with the schema. Indexes and constraints are not
// among them: Postgres puts them in their table's schema, and a statement
// names them unqualified.
var Objects = []string{
	"idempotency_keys",
	"atomicphase_audit",
	"atomicphase_status_history",
	"atomicphase_backlog_samples",
	"atomicphase_watch",
	"atomicphase_walk",
	"atomicphase_migration",
	"atomicphase_lease_lost",
	"atomicphase_advance",
	"atomicphase_finish",
	"atomicphase_advance_from",
	"atomicphase_finish_from",
}

// maxLen is the longest identifier Postgres keeps whole (NAMEDATALEN - 1
// bytes); it truncates longer ones.
const maxLen = 63

// Check returns an error saying why name cannot be the schema of the
// library's objects, or nil. The empty name is valid: it means the schema
// the connection's search_path finds.
//
// A name is used as it is, quoted: case matters, and "Payments" is not
// payments. It must be valid UTF-8 of at most 63 bytes, without control
// characters or double quotes (a name given already quoted is a mistake
// Check catches), and must not start with pg_, which Postgres keeps for
// its own schemas.
func Check(name string) error {
	switch {
	case name == "":
		return nil
	case !utf8.ValidString(name):
		return errors.New("schema name is not valid UTF-8")
	case len(name) > maxLen:
		return fmt.Errorf("schema name %q is %d bytes long; Postgres keeps names of at most %d", name, len(name), maxLen)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("schema name %q holds a control character", name)
	case strings.Contains(name, `"`):
		return fmt.Errorf(`schema name %q holds a double quote; give the name unquoted, as Postgres stores it`, name)
	case strings.HasPrefix(strings.ToLower(name), "pg_"):
		return fmt.Errorf("schema name %q starts with pg_, which Postgres keeps for system schemas", name)
	}
	return nil
}

// objectName matches one of Objects as a whole word.
var objectName = regexp.MustCompile(`\b(?:` + strings.Join(Objects, "|") + `)\b`)

// droppedIndex matches the name of an index that DROP INDEX drops: the one
// place where the migrations name an object that is not in Objects, and
// which DROP INDEX finds through the search_path only.
var droppedIndex = regexp.MustCompile(`(?i)\bDROP\s+INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)\b`)

// Qualify returns sql with each unqualified reference to one of Objects,
// and the index a DROP INDEX drops, prefixed with the schema name, quoted
// as an identifier. A string literal that is one of the names and nothing
// else, as in to_regclass('idempotency_keys') or 'idempotency_keys'::regclass,
// becomes the qualified name. Comments, other string literals and quoted
// identifiers are left as they are, so are names already qualified:
// qualifying a statement twice changes nothing. An empty name returns sql
// unchanged.
//
// name must have passed Check.
func Qualify(name, sql string) string {
	if name == "" {
		return sql
	}
	prefix := pgx.Identifier{name}.Sanitize() + "."
	var b strings.Builder
	b.Grow(len(sql) + 8*len(prefix))
	code := 0 // start of the code not yet written
	for i := 0; i < len(sql); {
		var end int
		switch {
		case sql[i] == '\'':
			end = quoted(sql, i, '\'')
		case sql[i] == '"':
			end = quoted(sql, i, '"')
		case strings.HasPrefix(sql[i:], "--"):
			end = strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				end = len(sql)
			} else {
				end += i
			}
		case strings.HasPrefix(sql[i:], "/*"):
			end = strings.Index(sql[i+2:], "*/")
			if end < 0 {
				end = len(sql)
			} else {
				end += i + 4
			}
		default:
			i++
			continue
		}
		qualifyCode(&b, prefix, sql[code:i])
		if lit := sql[i:end]; sql[i] == '\'' && len(lit) > 2 && objectName.FindString(lit[1:len(lit)-1]) == lit[1:len(lit)-1] {
			b.WriteString(`'` + strings.ReplaceAll(prefix, `'`, `''`) + lit[1:])
		} else {
			b.WriteString(lit)
		}
		i, code = end, end
	}
	qualifyCode(&b, prefix, sql[code:])
	return b.String()
}

// quoted returns the end of the literal or quoted identifier that starts
// at sql[i], whose quote q is escaped by doubling it.
func quoted(sql string, i int, q byte) int {
	for j := i + 1; j < len(sql); j++ {
		if sql[j] != q {
			continue
		}
		if j+1 < len(sql) && sql[j+1] == q {
			j++
			continue
		}
		return j + 1
	}
	return len(sql)
}

// qualifyCode writes code, SQL outside literals, comments and quoted
// identifiers, to b with the names Qualify qualifies prefixed.
func qualifyCode(b *strings.Builder, prefix, code string) {
	var at []int
	for _, m := range objectName.FindAllStringIndex(code, -1) {
		at = append(at, m[0])
	}
	for _, m := range droppedIndex.FindAllStringSubmatchIndex(code, -1) {
		// A keyword is no index name: the name that follows it is
		// quoted, or already qualified.
		name := code[m[2]:m[3]]
		keyword := strings.EqualFold(name, "if") || strings.EqualFold(name, "concurrently")
		if !keyword && (m[3] == len(code) || code[m[3]] != '.') {
			at = append(at, m[2])
		}
	}
	slices.Sort(at)
	last := 0
	for _, i := range slices.Compact(at) {
		if i > 0 && code[i-1] == '.' {
			continue // already qualified
		}
		b.WriteString(code[last:i])
		b.WriteString(prefix)
		last = i
	}
	b.WriteString(code[last:])
}
