package contract

import "fmt"

// BodyTooLargeMessage is the error message of a request body above the
// buffer limit of maxBodyBytes (413), in duet's reply and in Envoy's own
// (its local_reply_config), so that a client reads the same words from
// either.
func BodyTooLargeMessage(maxBodyBytes int) string {
	return fmt.Sprintf("request body exceeds the %d-byte limit", maxBodyBytes)
}
