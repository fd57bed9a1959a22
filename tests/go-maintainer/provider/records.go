package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Records keeps the package's record of each pod in a directory, one file
// per pod uid, so that the provider's restart keeps what the step knew
// (the retry budget, the wake verdict, which VM the post-clone-state was
// written for): after it, a pod left `running` resumes with no fact the
// runtime cannot give.
type Records struct {
	Dir string
}

func (r Records) path(uid string) (string, error) {
	for _, c := range uid {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return "", fmt.Errorf("pod uid %q is not a file name", uid)
		}
	}
	if uid == "" {
		return "", fmt.Errorf("no pod uid")
	}
	return filepath.Join(r.Dir, uid+".json"), nil
}

// Load returns the record kept for uid, or nil.
func (r Records) Load(ctx context.Context, uid string) (json.RawMessage, error) {
	path, err := r.path(uid)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	return b, err
}

// Store keeps record for uid, replacing the file whole.
func (r Records) Store(ctx context.Context, uid string, record json.RawMessage) error {
	path, err := r.path(uid)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(r.Dir, ".record-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(record); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
