// Package prefix keeps an approximate index of which prompt prefixes each
// routing target has seen, so that requests that repeat a prefix (multi-turn
// chats, shared system prompts) can go back to the target whose radix cache
// probably still holds it.
//
// # Model
//
// A prompt is cut into fixed-size blocks — bytes of text or token ids — and
// each block gets a chained hash, h[i] = xxhash64(h[i-1] || block i)
// ([Hasher]). Because every hash covers everything before it, one hash
// stands for a whole prefix: two prompts share h[i] exactly when (barring
// 64-bit collisions) they share their first i+1 blocks, and a trailing
// partial block is simply not hashed.
//
// An [Index] maps block hashes to the targets that hold them. When the
// scheduler sends a prompt to a target it calls [Index.Insert] with the
// prompt's hashes; to route the next prompt it calls [Index.Match], which
// reports, for every target holding at least the first block, how many
// leading blocks it holds.
//
// Each target keeps its blocks in its own LRU list bounded by the
// per-target limit given to [NewIndex]; past the bound the least recently
// used blocks are forgotten, as the engine's own cache would evict them.
// Insert touches a prompt's blocks from last to first, so a prefix is always
// more recent than its continuations and eviction trims chains from their
// tails; what a target holds is therefore always closed under prefixes.
// Match exploits that: the set of targets holding h[i+1] is a subset of
// those holding h[i], so Match only has to find, by binary search, the
// positions where the holder count drops, and never intersects sets block by
// block. Memory is O(targets × bound). [Index.Remove] forgets a target at
// once when its endpoint goes away.
//
// # Approximate by design
//
// The index sees only the routing decisions duet makes, not the engines'
// caches: an engine may have evicted a block the index still lists (memory
// pressure, restarts, other routers), and block boundaries do not line up
// with the engine's pages. Hash collisions are possible but negligible at 64
// bits. Callers should treat a match as a likelihood of a cache hit, weigh
// it against load, and never rely on it for correctness.
//
// # Files
//
// hasher.go (block cutting and chained hashing), index.go (the Index, Insert,
// Remove and eviction), target.go (one target's slab-backed LRU list) and
// match.go (Match).
package prefix
