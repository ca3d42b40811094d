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

// charBytes maps each byte-level character (below 512) back to the byte
// it stands for, -1 for characters outside the alphabet.
var charBytes = func() (t [512]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, c := range byteChars {
		t[c] = int16(b)
	}
	return t
}()

// charByte is the byte a byte-level character stands for.
func charByte(r rune) (byte, bool) {
	if r < 0 || int(r) >= len(charBytes) || charBytes[r] < 0 {
		return 0, false
	}
	return byte(charBytes[r]), true
}
