"""fedgp as a Flower app (see README "Beyond one machine")."""
