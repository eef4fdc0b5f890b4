"""The radix prefix cache: a tree keyed by token ids (whole pages), ref-counted locks, LRU eviction.
A request locks its path up to the root: unlocked nodes form whole subtrees, evicted leaf first.

The unlocked leaves wait in a heap by last access, so that an eviction does not walk the tree. An
entry goes out of date when its leaf is locked, gains a child, is used again or is evicted; the
heap keeps such entries and `_pop_lru` passes over them, and every unlocked leaf has an entry
that is up to date (a node that becomes one is pushed: `_push_leaf`; `check_invariants` checks)."""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from .base import CacheHandle, MatchResult, PrefixCache

_EMPTY = np.zeros(0, dtype=np.int32)


class RadixNode:
    __slots__ = ("key", "value", "parent", "children", "ref_count", "last_access", "depth")

    def __init__(self, key: np.ndarray, value: np.ndarray, parent: RadixNode | None) -> None:
        self.key = key  # token ids
        self.value = value  # KV slots, one per token
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.ref_count = 0
        self.last_access = 0
        self.depth = (parent.depth if parent is not None else 0) + len(key)

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixHandle(CacheHandle):
    """The node where a match ended; ``cached_len`` is its depth."""

    __slots__ = ("node",)

    def __init__(self, node: RadixNode) -> None:
        self.node = node

    @property
    def cached_len(self) -> int:  # type: ignore[override]
        return self.node.depth


class RadixCache(PrefixCache):
    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self.root = RadixNode(_EMPTY, _EMPTY, None)
        self.root.ref_count = 1  # never evicted
        self._clock = itertools.count(1)
        self.evictable_size = 0
        self._protected = 0
        # (last_access, id, push count, node): the order is the leaves' LRU order, `id` breaks
        # ties as a heap of the tree's leaves would, the count keeps a node out of comparisons
        self._leaves: list[tuple[int, int, int, RadixNode]] = []
        self._pushes = itertools.count()

    def _child_key(self, ids: np.ndarray) -> tuple[int, ...]:
        return tuple(ids[: self.page_size].tolist())

    def _common_len(self, key: np.ndarray, ids: np.ndarray) -> int:
        n = min(len(key), len(ids))
        diff = np.flatnonzero(key[:n] != ids[:n])
        common = int(diff[0]) if len(diff) else n
        return common // self.page_size * self.page_size

    def _walk(self, token_ids: list[int]) -> tuple[RadixNode, int]:
        """The deepest node `token_ids` matches and the tokens matched; splits where a match ends.
        Only the tokens compared with a node's are made an array (a prompt's own are not)."""
        node, pos, now, ps = self.root, 0, next(self._clock), self.page_size
        node.last_access = now
        while len(token_ids) - pos >= ps:
            child = node.children.get(tuple(token_ids[pos : pos + ps]))
            if child is None:
                break
            ids = np.asarray(token_ids[pos : pos + len(child.key)], dtype=np.int32)
            common = self._common_len(child.key, ids)
            if common < len(child.key):  # the match ends inside: the lookup after this one fails
                child = self._split(child, common)
            child.last_access = now
            node, pos = child, pos + common
        self._push_leaf(node)  # used now: a new place in the LRU order
        return node, pos

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node` after `at` tokens; returns the new upper part (same locks, same sizes)."""
        upper = RadixNode(node.key[:at], node.value[:at], node.parent)
        upper.ref_count, upper.last_access = node.ref_count, node.last_access
        node.parent.children[self._child_key(upper.key)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._child_key(node.key)] = node
        return upper

    def match(self, token_ids: list[int]) -> MatchResult:
        node, matched = self._walk(token_ids)
        return MatchResult(RadixHandle(node), self._path_slots(node, matched))

    def _path_slots(self, node: RadixNode, length: int) -> np.ndarray:
        parts = []
        while node is not self.root:
            parts.append(node.value)
            node = node.parent
        slots = np.concatenate(parts[::-1]) if parts else _EMPTY
        assert len(slots) == length
        return slots

    def lock(self, handle: CacheHandle) -> None:
        node = handle.node
        while node is not self.root:
            if node.ref_count == 0:
                self.evictable_size -= len(node.key)
                self._protected += len(node.key)
            node.ref_count += 1
            node = node.parent

    def unlock(self, handle: CacheHandle) -> None:
        node = handle.node
        while node is not self.root:
            assert node.ref_count > 0, "unlocking a path that is not locked"
            node.ref_count -= 1
            if node.ref_count == 0:
                self._protected -= len(node.key)
                self.evictable_size += len(node.key)
                self._push_leaf(node)
            node = node.parent

    def insert(self, token_ids: list[int], slots: np.ndarray) -> int:
        assert len(token_ids) == len(slots) and len(token_ids) % self.page_size == 0
        node, matched = self._walk(token_ids)
        if matched < len(token_ids):
            value = np.asarray(slots[matched:], dtype=np.int32).copy()
            leaf = RadixNode(np.array(token_ids[matched:], dtype=np.int32), value, node)
            leaf.last_access = next(self._clock)
            node.children[self._child_key(leaf.key)] = leaf
            self.evictable_size += len(leaf.key)
            self._push_leaf(leaf)
        return matched

    def evict(self, num_tokens: int) -> np.ndarray:
        freed, count = [], 0
        while count < num_tokens:
            node = self._pop_lru()
            if node is None:
                break
            need = -(-(num_tokens - count) // self.page_size) * self.page_size
            if len(node.key) > need:  # keep the head of a long leaf; evict only its tail
                self._split(node, len(node.key) - need)
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            freed.append(node.value)
            count += len(node.value)
            self.evictable_size -= len(node.key)
            self._push_leaf(parent)
        return np.concatenate(freed) if freed else _EMPTY

    def _evictable(self, node: RadixNode) -> bool:
        return node.ref_count == 0 and not node.children and node is not self.root

    def _push_leaf(self, node: RadixNode) -> None:
        """Give `node` an up-to-date entry in the heap if it is an unlocked leaf."""
        if not self._evictable(node):
            return
        heapq.heappush(self._leaves, (node.last_access, id(node), next(self._pushes), node))
        # NOTE: rebuilt from the tree once it holds twice the tree's pages (each node has one at
        # least): a rebuild's cost is spread over as many pushes
        if len(self._leaves) > 2 * self.size // self.page_size + 64:
            leaves = [n for n in self._nodes() if self._evictable(n)]
            self._leaves = [(n.last_access, id(n), next(self._pushes), n) for n in leaves]
            heapq.heapify(self._leaves)

    def _pop_lru(self) -> RadixNode | None:
        """The least recently used unlocked leaf, its entry taken; None if there is none."""
        while self._leaves:
            last_access, _, _, node = heapq.heappop(self._leaves)
            if last_access == node.last_access and self._evictable(node) and self._in_tree(node):
                return node
        return None

    def _in_tree(self, node: RadixNode) -> bool:
        return node.parent.children.get(self._child_key(node.key)) is node

    def _nodes(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root:
                out.append(node)
        return out

    @property
    def size(self) -> int:
        return self.evictable_size + self._protected

    @property
    def protected_size(self) -> int:
        return self._protected

    def slots(self) -> np.ndarray:
        values = [n.value for n in self._nodes()]
        return np.concatenate(values) if values else _EMPTY

    def check_invariants(self) -> None:
        """Tree facts the incremental sizes rely on (for tests)."""
        evictable = protected = 0
        for node in self._nodes():
            assert node.ref_count >= 0 and len(node.key) == len(node.value) > 0
            assert len(node.key) % self.page_size == 0
            assert node.depth == node.parent.depth + len(node.key)
            assert node.parent.children[self._child_key(node.key)] is node
            assert node.ref_count <= node.parent.ref_count or node.parent is self.root
            if node.ref_count == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
        assert (evictable, protected) == (self.evictable_size, self._protected), (
            f"sizes drifted: counted {evictable} evictable, {protected} protected; "
            f"kept {self.evictable_size}, {self._protected}"
        )
        entries = {id(n) for access, _, _, n in self._leaves if access == n.last_access}
        unlisted = [n for n in self._nodes() if self._evictable(n) and id(n) not in entries]
        assert not unlisted, f"{len(unlisted)} unlocked leaves have no up-to-date heap entry"
