"""The data plane: canonical schema, source adapters (later: DTGG planner, driver, executors, Flight)."""
