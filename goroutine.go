package pglease

import (
	"bytes"
	"runtime"
	"strconv"
)

// goroutineID returns the id of the calling goroutine, read from the first
// line of its stack ("goroutine 42 [running]:"). The Elector needs it for
// one thing: telling whether Close runs on its callbacks' goroutine, which
// it must then not wait for. It returns 0 if the line cannot be read.
func goroutineID() uint64 {
	var buf [64]byte
	line := buf[:runtime.Stack(buf[:], false)]
	line, ok := bytes.CutPrefix(line, []byte("goroutine "))
	if !ok {
		return 0
	}
	id, _, _ := bytes.Cut(line, []byte(" "))
	n, err := strconv.ParseUint(string(id), 10, 64)
	if err != nil {
		return 0
	}
	return n
}
