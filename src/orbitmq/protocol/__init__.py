"""Wire codecs, sans-IO: bytes in, events out. No sockets, no event loop."""
