package tokenize

// byteChars maps each byte to the printable character that byte-level BPE
// vocabularies write it as (GPT-2's bytes_to_unicode): printable Latin-1
// bytes stand for themselves, every other byte for 256 + its rank among
// them.
var byteChars = func() (t [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}()

// byteLevelDecode turns a vocabulary entry written in byte-level characters
// back into the bytes it stands for; ok is false if it has a character
// outside that alphabet.
func byteLevelDecode(s string) (out []byte, ok bool) {
	out = make([]byte, 0, len(s))
	for _, r := range s {
		b, found := charByte(r)
		if !found {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}

// charByte is the byte a byte-level character stands for.
func charByte(r rune) (byte, bool) {
	if r < 0 || r >= 256+256 {
		return 0, false
	}
	if r < 256 && byteChars[r] == r {
		return byte(r), true
	}
	if r >= 256 {
		for b, c := range byteChars {
			if c == r {
				return byte(b), true
			}
		}
	}
	return 0, false
}
