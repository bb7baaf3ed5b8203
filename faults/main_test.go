package faults_test

import (
	"testing"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestMain runs at most two of the package's tests at once, whatever
// -parallel says (pgtest.MostParallel).
func TestMain(m *testing.M) { pgtest.Main(m, pgtest.MostParallel(2)) }
