"""The HTTP API's routes, one router per resource; :func:`ffdl.api.app.create_app` includes them."""
