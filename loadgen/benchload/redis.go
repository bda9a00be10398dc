package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
)

// redisStats is what Redis reports of its own work since it started.
type redisStats struct {
	cpu      time.Duration // used_cpu_sys + used_cpu_user
	commands uint64        // total_commands_processed
}

// redisInfo asks the Redis at addr for its INFO. That INFO is not in its
// own count of commands, but is in the next one's.
func redisInfo(addr string) (redisStats, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return redisStats{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "*1\r\n$4\r\nINFO\r\n"); err != nil {
		return redisStats{}, err
	}
	info, err := readBulk(bufio.NewReader(c))
	if err != nil {
		return redisStats{}, err
	}
	return parseInfo(info)
}

// readBulk reads one RESP2 reply, which must be a bulk string.
func readBulk(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if msg, ok := strings.CutPrefix(line, "-"); ok {
		return "", fmt.Errorf("redis: %s", msg)
	}
	size, ok := strings.CutPrefix(line, "$")
	n, err := strconv.Atoi(size)
	if !ok || err != nil || n < 0 {
		return "", fmt.Errorf("redis: want a bulk string, got %q", line)
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("redis: bulk string of %d bytes: %w", n, err)
	}
	return string(b[:n]), nil
}

// parseInfo takes the CPU time and command count from INFO's text.
func parseInfo(info string) (redisStats, error) {
	var s redisStats
	seen := map[string]bool{}
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSuffix(line, "\r"), ":")
		if k != "used_cpu_sys" && k != "used_cpu_user" && k != "total_commands_processed" {
			continue
		}
		if seen[k] {
			return redisStats{}, fmt.Errorf("redis INFO: %s twice", k)
		}
		seen[k] = true
		if k == "total_commands_processed" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return redisStats{}, fmt.Errorf("redis INFO %s: %w", k, err)
			}
			s.commands = n
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return redisStats{}, fmt.Errorf("redis INFO %s: %w", k, err)
		}
		s.cpu += time.Duration(math.Round(sec*1e6)) * time.Microsecond
	}
	if len(seen) != 3 {
		return redisStats{}, errors.New("redis INFO: want used_cpu_sys, used_cpu_user and total_commands_processed")
	}
	return s, nil
}
