// Package data loads the Fashion-MNIST training data and text corpora for
// language models, and picks each step's mini-batch deterministically, so that
// every pipeline stage of a run agrees on the examples of step k without
// talking to the others. Each dataset is a Kind registered under the name
// data.dataset gives (one file and a Register call in its init): the
// built-in fashion-mnist and text, and those a program registers.
package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// idxUbyte is the IDX type code for unsigned bytes, the only one Fashion-MNIST uses.
const idxUbyte = 0x08

// maxIDXElems bounds the element count a header may claim. It keeps the
// product of the dimensions from overflowing and a corrupt header from
// asking for an absurd amount of memory (real files are ~47 MB).
const maxIDXElems = 1 << 34

// readIDXHeader reads the magic number and the dimensions. It is split out so
// a loader can learn a file's shape without reading its data.
func readIDXHeader(r io.Reader) (dims []int, elems int64, err error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, 0, fmt.Errorf("idx: reading magic: %w", truncated(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, 0, fmt.Errorf("idx: bad magic % x: want 00 00 <type> <ndims>", magic)
	}
	if magic[2] != idxUbyte {
		return nil, 0, fmt.Errorf("idx: data type 0x%02x not supported: only unsigned bytes (0x08)", magic[2])
	}
	n := int(magic[3])
	if n == 0 {
		return nil, 0, errors.New("idx: zero dimensions")
	}
	raw := make([]byte, 4*n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, 0, fmt.Errorf("idx: reading %d dimensions: %w", n, truncated(err))
	}
	dims = make([]int, n)
	elems = 1
	for i := range dims {
		d := int64(binary.BigEndian.Uint32(raw[4*i:]))
		dims[i] = int(d)
		elems *= d
		if elems > maxIDXElems {
			return nil, 0, fmt.Errorf("idx: dimensions %v too large", dims[:i+1])
		}
	}
	return dims, elems, nil
}

// ReadIDX parses one IDX file: the magic bytes 0x00 0x00 <type> <ndims>, then
// ndims big-endian uint32 dimensions, then the data in row-major order. Only
// unsigned byte data (type 0x08) is supported. A short or over-long file is
// an error rather than a panic or silently partial data.
func ReadIDX(r io.Reader) (dims []int, data []byte, err error) {
	dims, elems, err := readIDXHeader(r)
	if err != nil {
		return nil, nil, err
	}
	data, err = readIDXBody(r, elems)
	if err != nil {
		return nil, nil, err
	}
	return dims, data, nil
}

// readIDXBody reads the elems bytes of data that follow an IDX header.
func readIDXBody(r io.Reader, elems int64) ([]byte, error) {
	// ReadAll through a limit grows its buffer as data arrives, so a header
	// that lies about the size cannot make us allocate it up front.
	data, err := io.ReadAll(io.LimitReader(r, elems+1))
	if err != nil {
		return nil, fmt.Errorf("idx: reading data: %w", err)
	}
	if err := idxLength(int64(len(data)), elems); err != nil {
		return nil, err
	}
	return data, nil
}

// idxLength checks that an IDX file holds the n bytes of data its
// dimensions need.
func idxLength(n, elems int64) error {
	switch {
	case n < elems:
		return fmt.Errorf("idx: truncated: dimensions need %d bytes of data, file has %d", elems, n)
	case n > elems:
		return fmt.Errorf("idx: trailing bytes after the %d bytes that the dimensions describe", elems)
	}
	return nil
}

// truncated turns the EOF errors of io.ReadFull into a message saying what happened.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("truncated file")
	}
	return err
}
