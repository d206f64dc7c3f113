"""`python -m cronwell_operator [OPTIONS]` is `cronwell operator [OPTIONS]` (the database
from CRONWELL_DATABASE_URL, the cluster from KUBECONFIG or the in-cluster service account)."""

import sys

from cronwell.cli import main
from cronwell_operator.cli import operator

main.add_command(operator, "operator")
main(["operator", *sys.argv[1:]], prog_name="python -m cronwell_operator")
