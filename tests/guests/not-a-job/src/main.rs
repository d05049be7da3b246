fn main() {
    println!("hello")
}
