package config

// Parse compiles one limits file's content, named name in errors, as Load
// compiles the files of a directory. It reads nothing from disk: it is for
// configs built into the binary (the status page's demo) and for tests.
func Parse(name string, data []byte, opts Options) (*Table, error) {
	return compile([]source{{name: name, id: name, data: data}}, opts, nil)
}
