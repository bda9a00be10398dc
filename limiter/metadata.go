package limiter

// Metadata merges the metadata of the rules of the descriptors that
// passed (code OK, not unlimited), in descriptor order, as the
// reference's RESPONSE_DYNAMIC_METADATA does: the first value of a key
// wins, except that two mappings under one key are merged the same way.
// nil when there is none. The rules' own metadata is never modified; the
// result may share values with it and must not be modified either.
func (r *Response) Metadata() map[string]any {
	var out map[string]any
	for i := range r.Statuses {
		st := &r.Statuses[i]
		if st.Code != OK || st.Unlimited || st.Rule == nil || len(st.Rule.Metadata) == 0 {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(st.Rule.Metadata))
		}
		mergeMetadata(out, st.Rule.Metadata)
	}
	return out
}

// mergeMetadata merges src into dst, which the caller owns: a mapping of
// dst that src merges into is copied first.
func mergeMetadata(dst, src map[string]any) {
	for k, v := range src {
		have, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		hm, ok1 := have.(map[string]any)
		sm, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			continue
		}
		c := make(map[string]any, len(hm)+len(sm))
		for kk, vv := range hm {
			c[kk] = vv
		}
		mergeMetadata(c, sm)
		dst[k] = c
	}
}
