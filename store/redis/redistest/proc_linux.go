package redistest

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// procAttr makes a child die with the test process, even one killed by a
// panic that skipped the cleanups.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

// stopped reports whether process pid is stopped by a signal (state T in
// /proc/pid/stat), so that Pause returns only once Redis answers nothing.
func stopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}
