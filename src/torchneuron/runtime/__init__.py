"""The eager runtime: device registration, storages and views, dispatch, RNG, memory stats."""
