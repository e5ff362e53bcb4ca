package replicasync

import "unsafe"

// bytesOf views s as bytes without a copy; the caller never writes to them.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
