"""The gateway's serving state, one per event loop: the served models and their replicas (directory,
deployments source), live health, the requests waiting for a replica, admission, the log of the
router's decisions and the router statistics API."""
