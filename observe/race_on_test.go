//go:build race

package observe_test

const raceEnabled = true
