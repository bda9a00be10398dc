package config_test

import (
	"fmt"
	"log"

	"github.com/sluicehq/sluice/config"
)

func ExampleTable_Match() {
	tbl, err := config.Load("../examples/config", config.Options{})
	if err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 0, 128)
	for _, d := range [][]config.Entry{
		{{Key: "remote_address", Value: "198.51.100.1"}},
		{{Key: "api_key", Value: "k-123"}, {Key: "path", Value: "/v1/search/users"}},
		{{Key: "path", Value: "/v1/uploads/avatar.png"}},
		{{Key: "path", Value: "/v1/other"}},
	} {
		rule, key := tbl.Match("edge", d, buf[:0])
		if rule == nil {
			fmt.Printf("%v: no rule\n", d)
			continue
		}
		fmt.Printf("%s: %d/%s, key %s\n", rule.Path, rule.RequestsPerUnit, rule.Unit, key)
	}
	// Output:
	// remote_address: 100/second, key edge|remote_address=198.51.100.1|fw:1s
	// api_key.path_/v1/search*: 60/minute, key edge|api_key=k-123|path=/v1/search/users|fw:60s
	// path_/v1/uploads/*: 10/minute, key edge|path=/v1/uploads/*|tb:10/60s:20
	// [{path /v1/other}]: no rule
}
