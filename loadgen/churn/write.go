package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/loadgen"
)

// writeFiles writes the two CSV files and the markdown report.
func (r *report) writeFiles() error {
	return errors.Join(
		writeFile(r.s.csvPath, r.writeSamples),
		writeFile(r.s.secondsPath, r.writeSeconds),
		writeFile(r.s.mdPath, r.writeMarkdown))
}

func writeFile(path string, write func(io.Writer) error) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(write(f), f.Close())
}

func num(v float64) string {
	if math.IsNaN(v) {
		return ""
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// writeSamples: a row per replica and sample, a column per figure.
func (r *report) writeSamples(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := []string{"t_s", "replica", "redis_down"}
	for _, f := range figures {
		head = append(head, columnName(f))
	}
	cw.Write(head)
	for _, s := range r.rec.samples {
		row := []string{num(math.Round(s.At.Sub(r.rec.start).Seconds())), fmt.Sprintf("sluice%d", s.Replica+1), strconv.FormatBool(s.RedisDown)}
		for _, f := range figures {
			row = append(row, num(f.get(s)))
		}
		cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

// columnName is a figure's CSV column: "rss_mib", "metrics_series".
func columnName(f figure) string {
	n := strings.Trim(strings.NewReplacer("/", "", " ", "_").Replace(strings.ToLower(f.name)), "_")
	if f.unit != "" {
		n += "_" + strings.ToLower(f.unit)
	}
	return n
}

// writeSeconds: a row per second of RLS traffic, with the RLQS fleet's
// second that started then.
func (r *report) writeSeconds(w io.Writer) error {
	fleet := map[int64]loadgen.Second{}
	for _, s := range r.rec.fleet {
		fleet[s.Start.Unix()] = s
	}
	cw := csv.NewWriter(w)
	head := []string{"t_s", "unix", "judged"}
	for _, l := range limited {
		head = append(head, "route_"+l.name+"_offered", "route_"+l.name+"_granted", "route_"+l.name+"_granted_next_second", "route_"+l.name+"_limit")
	}
	cw.Write(append(head, "rls_errors_redis_up", "rls_errors_redis_down", "rlqs_offered", "rlqs_admitted", "rlqs_limit", "soak_lag_ms"))
	for _, sec := range slices.Sorted(maps.Keys(r.rec.rls)) {
		s := r.rec.rls[sec]
		row := []string{strconv.FormatInt(sec-r.rec.start.Unix(), 10), strconv.FormatInt(sec, 10), strconv.FormatBool(r.judgedSecond(time.Unix(sec, 0)))}
		for i, l := range limited {
			row = append(row, strconv.Itoa(s.Offered[i]), strconv.Itoa(s.Granted[i]), strconv.Itoa(s.Ambiguous[i]), strconv.Itoa(int(l.perSecond)))
		}
		row = append(row, strconv.Itoa(s.ErrUp), strconv.Itoa(s.ErrDown))
		if f, ok := fleet[sec]; ok {
			row = append(row, num(f.Offered), num(f.Admitted), num(f.Limit))
		} else {
			row = append(row, "", "", "")
		}
		cw.Write(append(row, strconv.FormatInt(r.rec.lag[sec].Milliseconds(), 10)))
	}
	cw.Flush()
	return cw.Error()
}

// summary prints the verdict to out.
func (r *report) summary(out io.Writer) {
	r.writeChecks(out)
	r.writeSlopes(out)
	fmt.Fprintf(out, "\nfiles: %s, %s, %s\n", r.s.csvPath, r.s.secondsPath, r.s.mdPath)
	if r.pass() {
		fmt.Fprintln(out, "PASS")
	} else {
		fmt.Fprintln(out, "FAIL")
	}
}

func (r *report) writeChecks(w io.Writer) {
	fmt.Fprintf(w, "\n| check | who | measured | threshold | result |\n|---|---|---|---|---|\n")
	for _, c := range r.checks {
		res := "pass"
		if !c.ok {
			res = "**FAIL**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c.name, c.who, c.measured, c.threshold, res)
	}
}

// writeSlopes: a row per figure, a column per replica: the slope per
// minute over the second half and the median there.
func (r *report) writeSlopes(w io.Writer) {
	fmt.Fprintf(w, "\n| figure (second half: slope per minute, median) |")
	for rep := range r.s.replicas {
		fmt.Fprintf(w, " sluice%d |", rep+1)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---:|", r.s.replicas))
	for i, f := range figures {
		name := f.name
		if f.unit != "" {
			name += " (" + f.unit + ")"
		}
		fmt.Fprintf(w, "| %s |", name)
		for _, ft := range r.fits[i] {
			if ft.n < 2 {
				fmt.Fprintf(w, " – |")
				continue
			}
			fmt.Fprintf(w, " %+.3g/min, "+f.format+" |", ft.slope, ft.median)
		}
		fmt.Fprintln(w)
	}
}
