"""The web dashboard (`cronwell ui`): server-rendered, read-only unless started with
--allow-actions; app.py builds the aiohttp app and its security middleware, views.py the
pages."""
