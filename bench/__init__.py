"""cronwell's benchmark suite: figures to compare, never assertions (`make bench`,
`python -m bench --only SECTION`). Not part of the product: nothing in cronwell imports it."""
