"""The application layer: wires libraries and services into the ways mutualrl runs —
`mutualrl run` (one process), `up` (processes on one host), `serve` (one service, as a
container runs it) and `controller` (MWRA). Nothing below this package imports it."""
