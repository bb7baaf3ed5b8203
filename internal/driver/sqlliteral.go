package driver

import (
	"bytes"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// inlineArgs returns query with each parameter ($1, $2, ...) replaced by its
// argument written as a literal, for a database/sql driver that sends a
// statement with arguments in two round trips (lib/pq: a parse, then an
// execute) and a single cancel request as the context ends. A cancel
// request that reaches the backend between those round trips finds it
// idle, and the server ignores it: the execute then runs uncancelled, a
// claim waiting on a row lock for as long as the lock is held. A statement
// without arguments goes in one message (the simple query protocol), which
// a cancel request reaches while it runs. It also saves a round trip.
//
// Each argument becomes what the driver would have sent for it, as an
// untyped literal the server types from its context as it types a
// parameter: E'...' with every backslash and quote escaped, which reads the
// same whatever standard_conforming_strings is, or NULL. The parameters
// are found outside quoted strings, quoted identifiers, dollar quotes and
// comments of query, whose own quoted strings are taken as written with
// standard_conforming_strings on, the server's default.
func inlineArgs(query string, args []any) (string, error) {
	if len(args) == 0 {
		return query, nil
	}
	lits := make([]string, len(args))
	for i, a := range args {
		lit, err := literal(a)
		if err != nil {
			return "", fmt.Errorf("pglease: argument $%d: %w", i+1, err)
		}
		lits[i] = lit
	}
	var b strings.Builder
	b.Grow(len(query) + 16*len(args))
	for i := 0; i < len(query); {
		c := query[i]
		end := i + 1
		switch {
		case c == '\'' || c == '"':
			escapes := c == '\'' && i > 0 && (query[i-1] == 'E' || query[i-1] == 'e') && (i < 2 || !identByte(query[i-2]))
			end = quoteEnd(query, i, c, escapes)
		case c == '-' && strings.HasPrefix(query[i:], "--"):
			end = len(query)
			if n := strings.IndexByte(query[i:], '\n'); n >= 0 {
				end = i + n + 1
			}
		case c == '/' && strings.HasPrefix(query[i:], "/*"):
			end = commentEnd(query, i)
		case c == '$' && (i == 0 || !identByte(query[i-1])):
			if n := digits(query[i+1:]); n > 0 {
				k, err := strconv.Atoi(query[i+1 : i+1+n])
				if err != nil || k < 1 || k > len(args) {
					return "", fmt.Errorf("pglease: statement has parameter %s but %d arguments", query[i:i+1+n], len(args))
				}
				b.WriteString(lits[k-1])
				i += 1 + n
				continue
			}
			end = dollarEnd(query, i)
		}
		b.WriteString(query[i:end])
		i = end
	}
	return b.String(), nil
}

// identByte reports whether c continues an identifier, of which a $ is
// then part ("a$1" is a name, not a parameter).
func identByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// quoteEnd is the end of the string or identifier quoted by q at i: a
// doubled q is one, and with escapes a backslash escapes the next byte.
func quoteEnd(s string, i int, q byte, escapes bool) int {
	for j := i + 1; j < len(s); j++ {
		switch {
		case escapes && s[j] == '\\':
			j++
		case s[j] == q && j+1 < len(s) && s[j+1] == q:
			j++
		case s[j] == q:
			return j + 1
		}
	}
	return len(s)
}

// commentEnd is the end of the comment opened at i; such comments nest.
func commentEnd(s string, i int) int {
	depth := 0
	for j := i; j+1 < len(s); j++ {
		switch {
		case s[j] == '/' && s[j+1] == '*':
			depth++
			j++
		case s[j] == '*' && s[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(s)
}

// dollarEnd is the end of the dollar-quoted string opened at i ($$ or
// $tag$), or i+1 when no dollar quote opens there.
func dollarEnd(s string, i int) int {
	j := i + 1
	for j < len(s) && s[j] != '$' && identByte(s[j]) && (j != i+1 || s[j] < '0' || s[j] > '9') {
		j++
	}
	if j >= len(s) || s[j] != '$' {
		return i + 1
	}
	tag := s[i : j+1]
	if n := strings.Index(s[j+1:], tag); n >= 0 {
		return j + 1 + n + len(tag)
	}
	return len(s)
}

// literal is a as a literal of the statement's text: what the driver
// sends for it, quoted, or NULL. A []byte, whose parameter's type the
// text does not tell, is written as bytesLiteral says.
func literal(a any) (string, error) {
	if v, ok := a.(sqldriver.Valuer); ok {
		if rv := reflect.ValueOf(a); rv.Kind() == reflect.Pointer && rv.IsNil() {
			return "NULL", nil
		}
		dv, err := v.Value()
		if err != nil {
			return "", err
		}
		if _, again := dv.(sqldriver.Valuer); again {
			return "", fmt.Errorf("the value of a %T is a driver.Valuer again", a)
		}
		return literal(dv)
	}
	v := reflect.ValueOf(a)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "NULL", nil
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		return "NULL", nil
	}
	if t, ok := v.Interface().(time.Time); ok {
		return quote(timeText(t))
	}
	switch v.Kind() {
	case reflect.String:
		return quote(v.String())
	case reflect.Bool:
		return quote(strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return quote(strconv.FormatInt(v.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return quote(strconv.FormatUint(v.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		switch {
		case math.IsInf(f, 1):
			return quote("Infinity")
		case math.IsInf(f, -1):
			return quote("-Infinity")
		}
		return quote(strconv.FormatFloat(f, 'g', -1, 64))
	case reflect.Slice:
		if v.IsNil() {
			return "NULL", nil
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return bytesLiteral(v.Bytes()), nil
		}
		return literal(arrayLiteral{v})
	}
	return "", fmt.Errorf("a %T cannot be sent to this database/sql driver", a)
}

// bytesLiteral is b as a literal. Its parameter's type is not known from
// the text, and the driver (lib/pq) sends b as is to a text parameter and
// in bytea's hex format to a bytea one, as pgx does: b is written as is
// when that reads the same as text and as bytea (valid UTF-8 without a
// backslash or NUL), else in bytea's hex format ('\x6869'), which a text
// parameter then reads as that text.
func bytesLiteral(b []byte) string {
	if utf8.Valid(b) && bytes.IndexByte(b, '\\') < 0 && bytes.IndexByte(b, 0) < 0 {
		return "E'" + strings.ReplaceAll(string(b), "'", "''") + "'"
	}
	return `E'\\x` + hex.EncodeToString(b) + "'"
}

// timeText is t as PostgreSQL reads a timestamptz: in UTC, whose offset
// is whole minutes (RFC 3339 drops an offset's seconds), with BC for a
// year before 1 (Go's year 0 is 1 BC).
func timeText(t time.Time) string {
	t = t.UTC()
	if y := t.Year(); y <= 0 {
		return fmt.Sprintf("%04d", 1-y) + t.Format("-01-02 15:04:05.999999999Z") + " BC"
	}
	return t.Format(time.RFC3339Nano)
}

// quote is s as an escape string literal: E'...', with each backslash and
// quote doubled.
func quote(s string) (string, error) {
	if err := checkText(s); err != nil {
		return "", err
	}
	return "E'" + escaper.Replace(s) + "'", nil
}

// checkText refuses text the server would not take as sent: with a NUL
// byte, or not valid UTF-8 (which the driver would otherwise pass on
// altered or whole, as pgx refuses it).
func checkText(s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("text with a NUL byte, which PostgreSQL text cannot hold")
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("text that is not valid UTF-8: %q", s)
	}
	return nil
}

var escaper = strings.NewReplacer(`\`, `\\`, `'`, `''`)
