// Package holder names a Locker's holder: the replica's name, and a
// suffix of its own that makes two Lockers of one replica, or of one
// process, two holders.
package holder

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// Sep separates a name from the suffix Own adds, and in a table without a
// fence column a Locker's holder from the suffix forged for each lease: a
// name given must not contain it.
const Sep = "#"

// Default is the name of a replica that gave none: hostname-pid.
func Default() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// Own is name, Sep and 16 random lowercase hex digits.
func Own(name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24
	return name + Sep + hex.EncodeToString(b[:])
}
