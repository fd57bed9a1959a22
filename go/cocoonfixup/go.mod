module cocoonfixup

go 1.19
