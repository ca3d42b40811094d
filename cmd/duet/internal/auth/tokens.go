package auth

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
)

// MinTokenLength is the shortest token ReadTokens accepts: tokens guard the
// routing of every request, so a guessable one is refused at start.
const MinTokenLength = 16

// ReadTokens reads the tokens in the file at path: one per line, blank
// lines and lines starting with # skipped, surrounding space trimmed. The
// first is the one Envoy is configured to send; the others are still
// accepted, so that a token can be rotated without refusing a running
// Envoy (docs/security.md).
func ReadTokens(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	var tokens [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		t := bytes.TrimSpace(sc.Bytes())
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		if len(t) < MinTokenLength {
			return nil, fmt.Errorf("token file %s, line %d: a token must have at least %d characters", path, line, MinTokenLength)
		}
		if bytes.ContainsAny(t, " \t\"\\") {
			return nil, fmt.Errorf("token file %s, line %d: a token must not contain spaces, quotes or backslashes", path, line)
		}
		tokens = append(tokens, bytes.Clone(t))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read token file %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("token file %s: %w", path, errNoToken)
	}
	return tokens, nil
}

var errNoToken = errors.New("no token in the file")

// FirstToken returns the token Envoy sends: the first in the file at path.
func FirstToken(path string) (string, error) {
	tokens, err := ReadTokens(path)
	if err != nil {
		return "", err
	}
	return string(tokens[0]), nil
}

// matchToken reports whether got is one of tokens, in time that does not
// depend on where got and a token first differ or on which token matched.
func matchToken(tokens [][]byte, got []byte) bool {
	match := 0
	for _, t := range tokens {
		match |= subtle.ConstantTimeCompare(t, got)
	}
	return match == 1
}
