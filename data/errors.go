package data

import "errors"

// ErrBadData is wrapped by the errors of data that cannot train the model
// (labels beyond its classes, examples of the wrong size, text outside its
// vocabulary): data that a restart would read again the same way. Test for it
// with errors.Is.
var ErrBadData = errors.New("bad data")
