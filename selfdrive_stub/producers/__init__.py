"""What feeds the stack: camerad (synthetic or recorded cameras), the car stub and the scenes it draws."""
