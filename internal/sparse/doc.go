// Package sparse keeps a kind of log line that a client or a failing
// dependency can repeat at will (a failed TLS handshake per connection,
// a failed exchange per interval) to one line per interval, with the
// count of the lines held back in the next one.
package sparse
