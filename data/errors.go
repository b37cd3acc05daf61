package data

import "errors"

// ErrBadData is wrapped by the errors of data that cannot train the model
// (labels beyond its classes, examples of the wrong size, text outside its
// vocabulary): data that a restart would read again the same way. Test for it
// with errors.Is.
var ErrBadData = errors.New("bad data")

// BadData marks err, keeping its text, as an error of data unfit for the
// model: errors.Is(BadData(err), ErrBadData) holds.
func BadData(err error) error { return badData{err} }

type badData struct{ err error }

func (e badData) Error() string      { return e.err.Error() }
func (e badData) Unwrap() error      { return e.err }
func (badData) Is(target error) bool { return target == ErrBadData }
