// Package keys checks lease keys: what PostgreSQL can store and a Locker
// accepts, how an error names a huge one, and whether one is probably
// gocron's default name of a job.
package keys

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// MaxLen is the longest key, in bytes, a Locker accepts.
const MaxLen = 1024

// Check returns why key cannot be a lease key, or nil.
func Check(key string) error {
	switch {
	case key == "":
		return errors.New("key is empty")
	case len(key) > MaxLen:
		return fmt.Errorf("key is %d bytes, longer than the longest a key may be (%d)", len(key), MaxLen)
	case strings.ContainsRune(key, 0):
		return errors.New("key contains a NUL byte, which PostgreSQL text cannot store")
	case !utf8.ValidString(key):
		return errors.New("key is not valid UTF-8")
	}
	return nil
}

// Short is key as an error names it: its first 64 bytes when longer.
func Short(key string) string {
	if len(key) <= 64 {
		return key
	}
	return key[:64] + "..."
}

// funcName matches what runtime.FuncForPC(...).Name() gives a function, a
// method or a closure: an import path, a package name, and dotted
// identifiers, with (*T) receivers, [...] type arguments, funcN closures
// (nested ones numbered .1, .2) and the -fm suffix of a method value.
var funcName = regexp.MustCompile(`^(?:[\w.~-]+/)*[\p{L}_][\p{L}\p{N}_]*(?:\.(?:\(\*?[\p{L}_][\p{L}\p{N}_]*(?:\[[^\]]*\])?\)|[\p{L}_][\p{L}\p{N}_]*(?:\[\.\.\.\])?|\d+))+(?:-fm)?$`)

// closureOrMethod matches the parts of a function name no job name a
// person writes has: a closure, a method value, a receiver.
var closureOrMethod = regexp.MustCompile(`\.func\d+(?:\.|$|-)|-fm$|\(\*?[\p{L}_]`)

// LooksLikeFuncName reports whether key is probably gocron's default name
// of a job: a Go function's name with its import path ("/"), of package
// main, or of a closure or method. A dotted name such as "billing.invoice"
// is not taken for one.
func LooksLikeFuncName(key string) bool {
	if !funcName.MatchString(key) {
		return false
	}
	return strings.Contains(key, "/") || strings.HasPrefix(key, "main.") || closureOrMethod.MatchString(key)
}
