import asyncio

raise asyncio.CancelledError("cancelled at import")
