#!/usr/bin/env bash
cd $(dirname $(realpath $0))
function-pythonic render xr.yaml composition.yaml
#function-pythonic render xr.yaml composition-real.yaml
