"""The web console (`orbitmq console`, extra ``orbitmq[console]``): server-rendered pages on
Starlette and Jinja2, live numbers over Server-Sent Events, htmx and uPlot vendored in
``static/`` (no build step). It reads the cluster through the admin client like any tool, so
its HTTP work never runs on a broker's cores. See docs/console.md."""
