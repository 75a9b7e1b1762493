"""Asyncio transport: framing over TCP, request/response correlation, TLS."""
