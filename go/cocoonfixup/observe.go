package cocoonfixup

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"sync"
)

// ObserveOptions say how the caller's watch saw the pod.
type ObserveOptions struct {
	// Live: the pod came in a watch event with no gap in the watch before
	// it; false for each pod of a list or a re-list.
	Live bool
	// WatchedSinceNew is what the last Observe of the same pod returned
	// (false for a pod not observed since the caller started).
	WatchedSinceNew bool
}

// Observe notes what the caller's watch saw of a pod in the pod's record
// (kept in records under the pod's uid), as the daemon notes every pod its
// own watch sees: a hibernation and the VM that comes after it, by which
// Run takes that VM for a wake with no event needed (spec section 2, rule
// 3: the host's hibernate history). Call it for every pod of a list or a
// re-list and for every watch event but a deletion, in the order the watch
// delivers them; a macOS pod need not be observed. Give Run the same
// Records through the same Planner: a Planner serialises the two's changes
// to one pod's record, and each keeps the other's part.
//
// It returns whether the pod has been watched without a gap since it was
// new, for RunOptions.WatchedSinceNew and the next Observe. An error
// (a record that could not be read or stored) is a gap: it returns false.
func (p *Planner) Observe(ctx context.Context, pod any, records Records, o ObserveOptions) (bool, error) {
	if err := p.unmade(); err != nil {
		return false, err
	}
	if records == nil {
		return false, invalid("Observe needs Records")
	}
	doc, err := document(pod)
	if err != nil {
		return false, err
	}
	var meta podMeta
	if err := json.Unmarshal(doc, &struct {
		Metadata *podMeta `json:"metadata"`
	}{&meta}); err != nil {
		return false, &Error{Code: CodeBadInput, Message: "the pod is not JSON as the API server returns it: " + err.Error()}
	}
	if meta.UID == "" {
		return false, &Error{Code: CodeBadInput, Message: "the pod has no metadata.uid: observe pods as the API server returns them"}
	}
	request := map[string]any{"op": "observe", "pod": string(doc), "live": o.Live, "watched_since_new": o.WatchedSinceNew}
	answer, err := p.updateRecord(ctx, records, meta.UID, "pod "+meta.Namespace+"/"+meta.Name, "record", request)
	if err != nil {
		return false, err
	}
	return answer.Watched, nil
}

// storedRecord is a stored record as a request carries it: bytes that are
// not JSON go as a string, which the library answers with a warning and a
// new record in its place, so a damaged store cannot stop every request.
func storedRecord(record json.RawMessage) any {
	if json.Valid(record) {
		return record
	}
	return string(record)
}

// keepTaskRecord keeps a Run's record (its remember action's) into the
// stored one, as the daemon keeps it: the task's parts when its copy is
// newer, what Observe noted as stored. A stored record that cannot be
// read is not overwritten.
func (p *Planner) keepTaskRecord(ctx context.Context, records Records, uid string, task json.RawMessage) error {
	_, err := p.updateRecord(ctx, records, uid, "pod uid "+uid, "stored", map[string]any{"op": "merge", "task": task})
	return err
}

// recordAnswer is what the observe and merge ops answer.
type recordAnswer struct {
	Record  json.RawMessage `json:"record"`
	Changed bool            `json:"changed"`
	Watched bool            `json:"watched_since_new"`
	Warning string          `json:"warning"`
}

// updateRecord is one read-modify-write of uid's record under its lock:
// the stored record goes into request under key, the op's answer is
// stored when it changed, and its warning is logged (about who) once the
// lock is released.
func (p *Planner) updateRecord(ctx context.Context, records Records, uid, who, key string, request map[string]any) (recordAnswer, error) {
	lock := p.records.of(uid)
	lock.Lock()
	answer, err := func() (recordAnswer, error) {
		defer lock.Unlock()
		stored, err := records.Load(ctx, uid)
		if err != nil {
			return recordAnswer{}, err
		}
		if len(stored) > 0 {
			request[key] = storedRecord(stored)
		}
		var answer recordAnswer
		if err := p.callInto(ctx, request, &answer); err != nil {
			return recordAnswer{}, err
		}
		if answer.Changed {
			err = records.Store(ctx, uid, answer.Record)
		}
		return answer, err
	}()
	if answer.Warning != "" {
		p.log("warn", who+": "+answer.Warning)
	}
	return answer, err
}

// recordLocks are 64 mutexes, a pod uid's chosen by its hash: enough
// that pods rarely wait for each other, bounded whatever the pods.
type recordLocks [64]sync.Mutex

func (l *recordLocks) of(uid string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return &l[h.Sum32()%uint32(len(l))]
}
