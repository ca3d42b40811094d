package legs

import (
	"io"
	"net/http"
)

func ioCopy(w io.Writer, r *http.Request) (int64, error) { return io.Copy(w, r.Body) }
