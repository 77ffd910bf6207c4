"""Input limits shared by the JSON API and the forms."""

MAX_JSON_DEPTH = 32
INT32_MAX = 2**31 - 1  # ids, seqs and steps in query parameters


def nesting_depth(value) -> int:
    """How deeply lists and objects nest in ``value`` (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def value_count(value, stop: int = 1_000_000) -> int:
    """Lists, objects and scalars in ``value``, counted as YAML counts nodes (stops past ``stop``)."""
    count, stack = 0, [value]
    while stack and count <= stop:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
            count += len(node)  # the keys
        elif isinstance(node, list):
            stack.extend(node)
    return count
