"""The suite's oracles: how an output field is read, compared and judged against the member it came from."""
