package baton

import (
	"strconv"
	"strings"
	"time"
)

// Limits of the wire protocol (version 1).
const (
	maxLine   = 1024
	maxKey    = 250
	maxValue  = 250
	maxLimit  = 10000
	minSecret = 16
	maxSecret = 128
)

// Request ops, as their letters on the wire.
const (
	opAcquire = 'A'
	opRelease = 'R'
	opKeep    = 'K'
	opQuery   = 'Q'
	opInfo    = 'I'
	opWatch   = 'W'
	opUnwatch = 'X'
	opAuth    = 'U'
)

// request is one request line to send.
type request struct {
	op      byte
	key     string
	token   uint64
	leaseMS uint64
	waitMS  uint64 // 0: wait without limit
	limit   int    // 0: no limit field
	value   string // "": no value field
	secret  string
}

// appendTo appends the request's line, "\n" included.
func (r *request) appendTo(b []byte) []byte {
	b = append(b, r.op)
	switch r.op {
	case opAcquire:
		b = append(b, ' ')
		b = append(b, r.key...)
		b = appendSeconds(b, r.leaseMS)
		b = appendSeconds(b, r.waitMS)
		if r.limit > 0 || r.value != "" {
			limit := r.limit
			if limit == 0 {
				limit = 1
			}
			b = append(b, ' ')
			b = strconv.AppendInt(b, int64(limit), 10)
		}
		if r.value != "" {
			b = append(b, ' ')
			b = append(b, r.value...)
		}
	case opRelease:
		b = append(b, ' ')
		b = append(b, r.key...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, r.token, 10)
	case opKeep:
		b = append(b, ' ')
		b = append(b, r.key...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, r.token, 10)
		b = appendSeconds(b, r.leaseMS)
	case opQuery, opWatch, opUnwatch:
		b = append(b, ' ')
		b = append(b, r.key...)
	case opAuth:
		b = append(b, ' ')
		b = append(b, r.secret...)
	}
	return append(b, '\n')
}

// appendSeconds appends a space and ms as seconds with up to 3 decimals.
func appendSeconds(b []byte, ms uint64) []byte {
	b = append(b, ' ')
	b = strconv.AppendUint(b, ms/1000, 10)
	if frac := ms % 1000; frac != 0 {
		b = append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
		for b[len(b)-1] == '0' {
			b = b[:len(b)-1]
		}
	}
	return b
}

// millisCeil is d in whole milliseconds, rounded up (so a short wait never
// becomes 0, which means no limit).
func millisCeil(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

// answer is one parsed answer line, or (kind 0) the news that the
// connection ended before the answer came.
type answer struct {
	kind    byte   // the answer's letter; 0: connection lost
	op      byte   // the op of the request it answers ('-': the connection)
	key     string // "" for I and U
	token   uint64 // A, Q, W
	slot    int    // A: -1 when the answer had none
	msLeft  uint64 // Q
	holders uint64 // W
	waiting uint64 // Q, W
	value   string // W: "" for "-"
	addr    string // M: "" for "-"
	reason  string // E
	info    string // I: the name=value pairs
}

// answerOp is the op of the request each plain answer letter answers.
func answerOp(kind byte) byte {
	switch kind {
	case 'A', 'T':
		return opAcquire
	case 'R', 'N':
		return opRelease
	}
	return kind
}

// parseAnswer parses one line without its line ending; ok false when it
// does not parse.
func parseAnswer(line string) (a answer, ok bool) {
	f := strings.Split(line, " ")
	if len(f[0]) != 1 {
		return a, false
	}
	a.kind = f[0][0]
	a.slot = -1
	n := len(f)
	num := func(s string) (uint64, bool) {
		v, err := strconv.ParseUint(s, 10, 64)
		return v, err == nil
	}
	var good = true
	switch a.kind {
	case 'A':
		if n != 3 && n != 4 {
			return a, false
		}
		a.token, good = num(f[1])
		a.key = f[2]
		if n == 4 {
			s, ok := num(f[3])
			good = good && ok && s < maxLimit
			a.slot = int(s)
		}
	case 'T', 'R', 'N', 'K', 'X':
		if n != 2 {
			return a, false
		}
		a.key = f[1]
	case 'Q':
		if n != 5 {
			return a, false
		}
		a.key = f[1]
		var g1, g2, g3 bool
		a.token, g1 = num(f[2])
		a.msLeft, g2 = num(f[3])
		a.waiting, g3 = num(f[4])
		good = g1 && g2 && g3
	case 'W':
		if n != 6 {
			return a, false
		}
		a.key = f[1]
		var g1, g2, g3 bool
		a.token, g1 = num(f[2])
		a.holders, g2 = num(f[3])
		a.waiting, g3 = num(f[4])
		good = g1 && g2 && g3
		if f[5] != "-" {
			a.value = f[5]
		}
	case 'M':
		if n != 4 || len(f[2]) != 1 {
			return a, false
		}
		if f[1] != "-" {
			a.addr = f[1]
		}
		a.op = f[2][0]
		a.key = f[3]
		if a.op == opInfo {
			a.key = ""
		}
		return a, true
	case 'E':
		if n != 4 || len(f[1]) != 1 {
			return a, false
		}
		a.op = f[1][0]
		a.key = f[2]
		a.reason = f[3]
		if a.op == opInfo || a.op == opAuth {
			a.key = ""
		}
		return a, true
	case 'I':
		a.info = strings.TrimPrefix(line, "I")
		a.info = strings.TrimPrefix(a.info, " ")
	case 'U':
		if n != 2 || f[1] != "ok" {
			return a, false
		}
	default:
		return a, false
	}
	a.op = answerOp(a.kind)
	return a, good
}

// checkKey: 1 to 250 bytes, none a space, a control byte or 0x7F.
func checkKey(key string) error {
	if !isField(key, maxKey) {
		return badArgument("bad key %q: 1 to %d bytes, no spaces or control characters", key, maxKey)
	}
	return nil
}

func isField(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c == 0x7f {
			return false
		}
	}
	return true
}

// checkValue: a holder's value is a key's bytes, but not "-" alone.
func checkValue(v string) error {
	if !isField(v, maxValue) || v == "-" {
		return badArgument("bad value %q: 1 to %d bytes, no spaces or control characters, not \"-\"", v, maxValue)
	}
	return nil
}

// checkSecret: 16 to 128 bytes of printable ASCII without spaces.
func checkSecret(s string) error {
	ok := len(s) >= minSecret && len(s) <= maxSecret
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 0x21 && s[i] <= 0x7e
	}
	if !ok {
		return badArgument("the secret must be %d to %d bytes of printable ASCII without spaces", minSecret, maxSecret)
	}
	return nil
}

// checkLease: above 0; in whole milliseconds, rounded up.
func checkLease(lease time.Duration) (uint64, error) {
	if lease <= 0 {
		return 0, badArgument("the lease must be above 0")
	}
	return millisCeil(lease), nil
}
